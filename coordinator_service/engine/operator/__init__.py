"""The operators' actions on sinks, one module per concern; engine.operations.Operations is made of them."""
