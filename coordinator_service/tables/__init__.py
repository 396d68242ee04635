"""The table format: Iceberg tables through pyiceberg (markers, appends, held epochs, the files a table's metadata
reaches, maintenance steps, the checks of a pre-commit's files), the warehouse and how to read the tables."""
