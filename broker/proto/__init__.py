"""Generated gRPC stubs of the orderlymq.v1 wire API (regenerate with ``make proto``)."""
