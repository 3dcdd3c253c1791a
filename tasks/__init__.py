"""One module per pipeline stage. Each stage is a plain function usable without Prefect; the Prefect tasks that
wrap them live in flows/grpo_pipeline.py."""
