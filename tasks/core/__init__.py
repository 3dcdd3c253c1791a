"""What every stage stands on: stage keys and output folders (stage), artifact references and shared types (common),
MLflow runs (tracking), multi-process launches (launch), sharing inputs with a remote work pool (publish) and Hub
downloads (hub)."""
