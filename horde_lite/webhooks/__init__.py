"""Webhooks of text requests: the URL a request names, checked at admission (targets.py), and a
POST to it for each finished generation, sent in the background (delivery.py) with upstream's body
(payload.py)."""
