"""orderlymq connector: the Python client (``connector.client``) and the Spark data source
``orderlymq`` (``connector.spark``). Imports only the wire layer of ``broker``."""
