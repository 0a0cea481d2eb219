"""The webhook ingress: a stateless HTTP front that authenticates senders and hands their
requests to the events topic (``matcher ingress``)."""
