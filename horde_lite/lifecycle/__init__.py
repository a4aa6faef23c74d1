"""The request lifecycle: every rule, no HTTP. Imports the data layer and the policy protocols."""
