"""Results ledger, verdict, renderings (HTML, JUnit), signing and the handover CLI."""
