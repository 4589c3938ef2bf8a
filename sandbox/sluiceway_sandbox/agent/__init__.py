"""The node agent: the sandbox's stand-in for the kubelet.

It registers one Node (cpu, memory, a configurable ``nvidia.com/gpu`` count), keeps its Lease fresh,
watches the Pods the scheduler binds to it, and runs each container as a local process of this
Python environment inside the pod's own network namespace and private mount namespace. It does NOT
pull or run images (only known images map to installed entrypoints), enforce resource limits or
security contexts (processes run as the agent's user), serve the kubelet API (no ``kubectl
logs/exec``), run a DNS server, or support PersistentVolumeClaims/hostPath.
"""
