"""Prefect flows: the pipeline DAG."""
