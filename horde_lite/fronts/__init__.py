"""The OpenAI-compatible fronts' lifecycles, without HTTP: a chat or text completion created, waited
for and answered."""
