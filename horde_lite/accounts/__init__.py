"""Accounts: users and their keys, shared keys, kudos (the ledger and holds), transfers, workers and
the limits one owner may reach."""
