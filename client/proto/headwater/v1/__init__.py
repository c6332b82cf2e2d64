"""headwater.v1: the ranking service's gRPC messages and stubs (generated at ``make setup``)."""
