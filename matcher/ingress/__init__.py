"""The webhook ingress: a stateless HTTP front that authenticates senders and hands their
requests to the events topic (``matcher ingress``); with a database, it also completes
waits by their callback URLs."""
