"""The model under test as users hold it: a Python object, a model file, an HTTP text endpoint or a chat model."""
