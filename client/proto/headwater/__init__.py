"""Generated code of the headwater.* proto packages (see ``client/proto/generate.py``)."""
