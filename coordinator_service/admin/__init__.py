"""The admin API and the console (FastAPI): routes, authentication, schemas, pages."""
