"""Who may speak for which tenant, and proof that they did: the producer registry,
Standard Webhooks signatures, and payload validation. Pure logic; the file I/O of
loading the registry is in ``registry.load_registry``."""
