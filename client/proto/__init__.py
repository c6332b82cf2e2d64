"""The service's protocol buffers; the generated code is built by ``generate.py`` at ``make setup``."""
