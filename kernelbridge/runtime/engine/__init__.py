"""The engine API backend: the Docker Engine API of dockerd or ``podman system service``.

Import what you need from its modules (this package imports none of them, so that reading an
endpoint does not load the HTTP stack):

==============  ====================================================================================
``api``         ``EngineRuntime``: one engine's containers (create, attach, remove, inspect, list,
                info) and ``open_engine``
``images``      ``EngineImages``: the same engine's images (labels, import, tag, list, remove, build)
``placement``   ``EngineSet`` / ``ImageSet``: several engines as one backend, least-loaded placement
``connect``     opening an engine: a URL, a system socket, our own podman service
``endpoint``    engine URLs (``unix://``, ``tcp://`` + TLS, ``ssh://``) and default sockets; no I/O
``service``     helper processes: our own podman service, an ssh forward
``transport``   HTTP to one engine: the connection pool, bounded calls, hijacked connections
``stream``      a container's stdio over a hijacked connection (the attach stream's codec)
``body``        the container-create body, rendered from ``runtime.flags``
==============  ====================================================================================
"""
