"""Thin Prefect tasks: a decorator (retries, caching, timeouts) around one call into dots."""
