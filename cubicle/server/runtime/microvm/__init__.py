"""The `microvm` runtime: desktops in QEMU microVMs (see docs/microvm.md).

`image` builds what the VMs boot, `qemu` runs one VM, `channel` is the host's end of the
virtio-serial channel, `network` the backend of a VM's NIC, `snapshot` the files of
templates and snapshots, `sandbox` boots, restores and saves VMs, `runtime` is the
`Runtime` the service uses. Nothing is imported here: the service loads
`runtime.MicroVmRuntime` when the runtime is first used.
"""
