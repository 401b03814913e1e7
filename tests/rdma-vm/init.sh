#!/bin/busybox sh
# tests/rdma-vm/init.sh - PID 1 of ferry's RDMA test guest (vm.sh puts it in
# the initramfs as /init). It never runs on a host (it checks it is PID 1).
#   first:  load the virtio and 9p modules; mount the host's / read-only with
#           a tmpfs over it (overlay), the kernel's module tree, the control
#           folder (ctl: the command, its exit status) and the shared
#           folders; switch_root into it
#   second: proc, sys, dev, lo; wire.sh (the two rxe devices); the command;
#           its status into ctl/rc; power off through QEMU's isa-debug-exit
B=/bin/busybox
[ $$ = 1 ] || { echo "init.sh is the RDMA guest's init, not a program for a host" >&2; exit 1; }
arg() { for w in $($B cat /proc/cmdline); do case $w in "$1="*) echo "${w#*=}"; return;; esac; done; }
P9="trans=virtio,version=9p2000.L,msize=262144"

if [ "$1" != second ]; then
	$B mount -t proc proc /proc
	$B mount -t sysfs sys /sys
	$B mount -t devtmpfs dev /dev
	for m in $($B cat /ko/order); do $B insmod /ko/$m || echo "ferry-vm: insmod $m failed"; done
	$B mount -t 9p -o $P9,ro,cache=loose hostroot /ro || { echo "ferry-vm: no host root"; exit 1; }
	$B mount -t tmpfs -o mode=755 rw /rw
	$B mkdir -p /rw/up /rw/work
	$B mount -t overlay -o lowerdir=/ro,upperdir=/rw/up,workdir=/rw/work root /root ||
		{ echo "ferry-vm: no overlay"; exit 1; }
	kver=$(arg ferryvm.kver)
	$B mount -t tmpfs -o mode=755 run /root/run
	$B mount -t tmpfs -o mode=1777 tmp /root/tmp
	$B mkdir -p /root/usr/lib/modules/$kver /root/run/ferry-vm /root/.ferry-vm
	$B mount -t 9p -o $P9,ro,cache=loose kmods /root/usr/lib/modules/$kver
	$B mount -t 9p -o $P9,cache=mmap ctl /root/run/ferry-vm
	i=0
	for s in $(arg ferryvm.shares | $B tr , ' '); do
		$B mkdir -p /root$s
		$B mount -t 9p -o $P9,cache=mmap share$i /root$s || echo "ferry-vm: cannot share $s"
		i=$((i + 1))
	done
	$B cp /init /root/.ferry-vm/init
	$B cp $B /root/.ferry-vm/busybox
	$B umount /proc /sys
	$B mount --move /dev /root/dev
	exec $B switch_root /root /.ferry-vm/busybox sh /.ferry-vm/init second
fi

B=/.ferry-vm/busybox
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
$B mkdir -p /dev/pts /dev/shm
$B mount -t devpts devpts /dev/pts
$B mount -t tmpfs -o mode=1777 shm /dev/shm
$B ln -sf /proc/self/fd /dev/fd
$B hostname ferry-rdma-vm
ip link set lo up
C=/run/ferry-vm
$B stty -onlcr 2>/dev/null
if /bin/bash $($B cat $C/wire) >$C/wire.log 2>&1; then
	. /run/ferry-vm/wire.env
	/bin/bash $C/cmd
	echo $? >$C/rc
else
	echo "ferry-vm: the rxe wire failed:"
	$B cat $C/wire.log
	echo 125 >$C/rc
fi
$B sync
printf '\000' | $B dd of=/dev/port bs=1 seek=244 count=1 2>/dev/null
$B poweroff -f
