"""Importers for the policy files of the projects Visor's users come from."""
