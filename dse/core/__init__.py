"""The vocabulary every layer speaks: trial records and their states, errors, bounds,
expressions, safe YAML, names, measurement settings, the environment policy, the registry of
plug-in names, measured tables, figures. Imports nothing else of dse."""
