"""Prompt filters: a moderator's regular expressions screened against every request's prompt or
chat messages at admission, each either refusing the request or replacing what it matched
(docs/reference/moderation.md)."""
