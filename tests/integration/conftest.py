import pytest


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray for the whole integration session (4 logical CPUs, 1 GB object store)."""
    import ray

    from raycpt.config import RayConfig
    from raycpt.runtime import init_ray

    started = init_ray(RayConfig(num_cpus=4, object_store_memory=1_000_000_000))
    yield ray
    if started:
        ray.shutdown()
