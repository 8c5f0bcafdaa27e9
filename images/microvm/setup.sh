#!/bin/sh
# Runs inside the new root filesystem (chroot) at the end of `cubicle image build`.
set -eu
# The desktop's user (the same uid as in the local runtime).
useradd --uid 1000 --user-group --create-home --shell /bin/bash user
# Mount points: the desktop's own disk, and the guest package's layer.
mkdir -p /data /opt/cubicle
# The VM's identity lives in /run (the root filesystem is read-only and shared): the VM
# agent writes these files at every boot and every restore from a snapshot.
for f in hostname hosts machine-id resolv.conf; do
    rm -f "/etc/$f"
    ln -s "/run/identity/$f" "/etc/$f"
done
mkdir -p /var/lib/dbus
ln -sf /etc/machine-id /var/lib/dbus/machine-id
