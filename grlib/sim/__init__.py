"""Simulations at scales this machine cannot run: balance (load imbalance across data-parallel ranks)."""
