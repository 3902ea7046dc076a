import sys

import actors.gateway


def test_public_names() -> None:
    assert set(actors.gateway.__all__) == {
        "ApiError",
        "ApiKeys",
        "Gateway",
        "GatewayActor",
        "GatewayConfig",
        "GenerationError",
        "GeneratorsBusy",
        "NoGenerators",
        "ServeCall",
        "ServeClient",
        "read_api_keys",
    }
    for name in actors.gateway.__all__:
        assert getattr(actors.gateway, name) is not None


def test_importing_the_config_stays_light() -> None:
    import subprocess

    code = "import actors.gateway, sys; assert 'fastapi' not in sys.modules and 'uvicorn' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
