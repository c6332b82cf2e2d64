"""Generated code of the headwater.* proto packages (see ``serving/proto/generate.py``)."""
