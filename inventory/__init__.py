"""Cluster inventories and SKU profiles: what the harness tests and what it expects to find."""
