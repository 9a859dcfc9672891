"""Orchestration: the LightningModule, the warm start, diagnostics and evaluation."""
