"""``python -m kernelbridge.inside.agent``: the sandbox agent, the container's PID 1 (the image's CMD)."""

from kernelbridge.inside.agent.relay import main

main()
