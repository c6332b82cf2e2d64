"""The headwater ranking service."""
