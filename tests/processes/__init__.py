"""Several processes sharing one durable backend: real worker processes, or separate backend instances standing in for them."""
