"""Global dispatchers: which worker an arriving request goes to."""
