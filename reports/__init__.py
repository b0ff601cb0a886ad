"""From a run's ledger to its documents: verdict, results.json (schema-checked), HTML, JUnit,
CSV, and their signatures. Data in, documents out: nothing here runs a check."""
