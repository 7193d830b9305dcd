"""The engine API backend: the Docker Engine API of dockerd or ``podman system service``.

Import what you need from its modules (``api``, ``images``, ``placement``, ``connect``, ...): this
package imports none of them, so that reading an endpoint does not load the HTTP stack.
"""
