"""One module per notebook: the whole logic of each pipeline stage, callable from tests."""
