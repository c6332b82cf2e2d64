"""The headwater registry: YAML feature definitions, validation, cost, plan/apply, the CLI."""
