#!/usr/bin/env bash
# tests/rdma-vm/vm.sh - ferry's guest for tests on real verbs: a small QEMU
# guest booted from Debian's own kernel (which has the Soft-RoCE driver
# rdma_rxe), whose root is this host's / (read-only over virtio-9p, a tmpfs
# on top), with two rxe devices joined by a veth pair (wire.sh). Host-built
# test programs run in it unchanged, against the host's libibverbs and
# librdmacm.
#
#   vm.sh prepare           install what it needs (root), fetch the kernel
#                           package, build the initramfs: once, cached in
#                           $FERRY_RDMA_VM_CACHE (~/.cache/ferry/rdma-vm),
#                           keyed by the kernel version and init.sh (stamp)
#   vm.sh why-not           print why the guest cannot run here (nothing: it can)
#   vm.sh run [-t SECS] [-m MEM] [-s DIR]... -- CMD [ARG...]
#                           boot one guest, run CMD there (as root, in the
#                           current folder, bash, stdin /dev/null), power
#                           off; exit with CMD's status (124: time limit,
#                           125: no result from the guest). -s shares a host
#                           folder read-write at its own path; -m sets the
#                           guest's memory (QEMU's -m: 1G by default, 3G
#                           for bench/rdma_guest.sh's 190 MB transfers).
#
# In CMD's environment: RDMA_IP0=198.18.1.1 (on rxe0), RDMA_IP1=198.18.1.2
# (on rxe1). rdma_cm crosses the wire when bound to one and sent to the other.
# TCG only (no KVM is assumed); root only (9p passthrough, apt-get).
set -uo pipefail

HERE=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)
CACHE=${FERRY_RDMA_VM_CACHE:-${HOME:-/root}/.cache/ferry/rdma-vm}
run= qpid=
PKGS=(qemu-system-x86 busybox-static cpio kmod xz-utils iproute2 libibverbs1 librdmacm1
      ibverbs-providers ibverbs-utils rdmacm-utils perftest)

die() { echo "rdma-vm: $*" >&2; exit 125; }

kernel_pkg() {
	apt-cache depends linux-image-amd64 2>/dev/null |
		awk '/Depends: linux-image-[0-9]/ { print $2; exit }'
}

why_not() {
	((EUID == 0)) || { echo "not root"; return; }
	command -v qemu-system-x86_64 >/dev/null 2>&1 || { echo "qemu-system-x86_64 missing"; return; }
	[[ -f $CACHE/vmlinux && -f $CACHE/initramfs.cpio && -f $CACHE/kver ]] ||
		{ echo "no guest kernel in $CACHE (vm.sh prepare)"; return; }
	[[ -d $CACHE/modules/$(cat "$CACHE/kver") ]] || echo "no module tree in $CACHE"
}

prepare() {
	local missing=() p kpkg kver want deb mods off t0=$SECONDS
	((EUID == 0)) || die "prepare: must run as root"
	for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
	if ((${#missing[@]})); then
		echo "rdma-vm: installing ${missing[*]}"
		DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -qq \
			--no-install-recommends "${PKGS[@]}" >/dev/null ||
			{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
				apt-get -o DPkg::Lock::Timeout=900 install -y -qq \
				--no-install-recommends "${PKGS[@]}" >/dev/null; } ||
			die "apt-get install ${PKGS[*]} failed"
	fi
	kpkg=${FERRY_RDMA_VM_KPKG:-$(kernel_pkg)}
	[[ -n $kpkg ]] || { apt-get update -qq; kpkg=$(kernel_pkg); }
	[[ -n $kpkg ]] || die "cannot tell which kernel linux-image-amd64 points at"
	kver=${kpkg#linux-image-}
	want="$kver $(cat "$HERE/init.sh" | sha256sum | cut -c1-16)"
	if [[ -f $CACHE/stamp && $(cat "$CACHE/stamp") == "$want" ]]; then
		echo "rdma-vm: guest ready in $CACHE ($kver)"
		return 0
	fi
	mkdir -p "$CACHE" || die "cannot make $CACHE"
	exec 9>"$CACHE/lock"
	flock 9
	rm -rf "$CACHE/x" "$CACHE/modules" "$CACHE"/*.deb "$CACHE/stamp"
	(cd "$CACHE" && apt-get download "$kpkg" >/dev/null 2>&1) ||
		{ apt-get update -qq && (cd "$CACHE" && apt-get download "$kpkg" >/dev/null 2>&1); } ||
		die "apt-get download $kpkg failed"
	deb=$(ls "$CACHE/${kpkg}"_*.deb 2>/dev/null | head -n 1)
	[[ -n $deb ]] || die "no $kpkg package downloaded"
	dpkg-deb -x "$deb" "$CACHE/x" || die "dpkg-deb -x $deb failed"
	rm -f "$deb"
	mods=$CACHE/x/lib/modules/$kver
	find "$mods" -name 'rdma_rxe.ko*' | grep -q . || die "$kpkg has no rdma_rxe"
	# The guest needs networking, RDMA, virtio and 9p: the rest of the tree goes.
	for p in drivers/gpu drivers/media drivers/net/wireless drivers/net/ethernet sound \
		drivers/staging drivers/usb drivers/bluetooth drivers/iio drivers/hid drivers/input \
		drivers/scsi drivers/ata drivers/mmc drivers/mtd drivers/isdn drivers/md \
		drivers/platform net/wireless net/mac80211 net/bluetooth fs/xfs fs/btrfs fs/ext4 \
		fs/f2fs fs/nfs fs/nfsd fs/smb fs/cifs fs/ocfs2 fs/gfs2; do
		rm -rf "${mods:?}/kernel/$p"
	done
	depmod -b "$CACHE/x" "$kver" || die "depmod failed"
	# Booted as an ELF through PVH: no decompressor to run under emulation.
	off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$CACHE/x/boot/vmlinuz-$kver" | head -n 1 | cut -d: -f1)
	[[ -n $off ]] || die "vmlinuz-$kver holds no xz stream"
	tail -c +$((off + 1)) "$CACHE/x/boot/vmlinuz-$kver" | xz -dc --single-stream \
		>"$CACHE/vmlinux" 2>/dev/null
	[[ $(head -c 4 "$CACHE/vmlinux" | od -An -c | tr -d ' ') == 177ELF ]] ||
		die "could not unpack vmlinux"
	# The initramfs: busybox, the modules that reach the 9p root, init.sh.
	local ir=$CACHE/ir
	rm -rf "$ir"
	mkdir -p "$ir"/{bin,ko,proc,sys,dev,ro,rw,root}
	cp /bin/busybox "$ir/bin/busybox" || die "busybox-static missing"
	for p in virtio_pci 9pnet_virtio 9p overlay; do
		modprobe -d "$CACHE/x" -S "$kver" --show-depends "$p"
	done | awk '$1 == "insmod" && !seen[$2]++ { print $2 }' >"$ir/list"
	while read -r p; do
		cp "$p" "$ir/ko/" && basename "$p" >>"$ir/ko/order"
	done <"$ir/list"
	rm -f "$ir/list"
	install -m 755 "$HERE/init.sh" "$ir/init"
	(cd "$ir" && find . | cpio -o -H newc --quiet) >"$CACHE/initramfs.cpio" ||
		die "cpio failed"
	mkdir -p "$CACHE/modules"
	mv "$mods" "$CACHE/modules/$kver"
	rm -rf "$ir" "$CACHE/x"
	echo "$kver" >"$CACHE/kver"
	echo "$want" >"$CACHE/stamp"
	echo "rdma-vm: guest made in $CACHE ($kver, $((SECONDS - t0)) s)"
}

run_guest() {
	local tlimit=600 mem=1G shares=() s rc kver append i
	while (($#)); do
		case $1 in
		-t) tlimit=$2; shift 2 ;;
		-m) [[ $2 =~ ^[0-9]+[MG]$ ]] || die "-m takes a size such as 1G or 3072M"
		    mem=$2; shift 2 ;;
		-s) shares+=("$(cd "$2" && pwd -P)") || die "no folder $2"; shift 2 ;;
		--) shift; break ;;
		*) break ;;
		esac
	done
	(($#)) || die "run: no command"
	# The guest's /tmp, /run and /dev/shm are its own tmpfs: a checkout (or
	# a working folder) under one of them would be invisible there, so it
	# is shared (a clean clone made by mktemp -d, as CI does).
	local top
	top=$(cd "$HERE/../.." && pwd -P)
	for s in "$top" "$(pwd -P)"; do
		case $s in
		/tmp/* | /run/* | /dev/shm/*) ;;
		*) continue ;;
		esac
		[[ $s == "$top" || $s != "$top"/* ]] || continue # inside the checkout
		[[ " ${shares[*]} " == *" $s "* ]] || shares+=("$s")
	done
	s=$(why_not)
	[[ -z $s ]] || die "cannot run the guest: $s"
	kver=$(cat "$CACHE/kver")
	for s in "${shares[@]}"; do
		[[ $s != *[[:space:]:,]* ]] || die "a shared path may hold no space, ':' or ','"
	done
	run=$(mktemp -d /tmp/ferry-rdma-vm.XXXXXX) || die "mktemp failed"
	qpid=
	trap '[[ -n $qpid ]] && kill "$qpid" 2>/dev/null; [[ -n $run ]] && rm -rf "$run"' EXIT
	{
		printf 'cd %q || exit 125\n' "$(pwd -P)"
		printf 'exec'
		printf ' %q' "$@"
		printf ' </dev/null\n'
	} >"$run/cmd"
	printf '%q ' "$HERE/wire.sh" >"$run/wire"
	append="console=ttyS0 quiet loglevel=2 panic=-1 reboot=t tsc=reliable no_timer_check"
	append+=" mitigations=off nowatchdog random.trust_cpu=on ferryvm.kver=$kver"
	append+=" ferryvm.shares=$(IFS=,; echo "${shares[*]}")"
	local q=(qemu-system-x86_64 -nodefaults -no-user-config -no-reboot -display none
		-M pc -m "$mem" -smp 2 -nic none -accel tcg,thread=multi,tb-size=256 -cpu max
		-device isa-debug-exit,iobase=0xf4,iosize=0x04
		-kernel "$CACHE/vmlinux" -initrd "$CACHE/initramfs.cpio" -append "$append"
		-fsdev local,id=r,path=/,security_model=none,readonly=on,multidevs=remap
		-device virtio-9p-pci,fsdev=r,mount_tag=hostroot
		-fsdev "local,id=k,path=$CACHE/modules/$kver,security_model=none,readonly=on"
		-device virtio-9p-pci,fsdev=k,mount_tag=kmods
		-fsdev "local,id=c,path=$run,security_model=passthrough"
		-device virtio-9p-pci,fsdev=c,mount_tag=ctl
		-chardev stdio,id=con,signal=off -serial chardev:con)
	[[ -f /usr/share/qemu/qboot.rom ]] && q+=(-bios /usr/share/qemu/qboot.rom)
	i=0
	for s in "${shares[@]}"; do
		q+=(-fsdev "local,id=s$i,path=$s,security_model=passthrough,multidevs=remap"
			-device "virtio-9p-pci,fsdev=s$i,mount_tag=share$i")
		i=$((i + 1))
	done
	"${q[@]}" </dev/null &
	qpid=$!
	local end=$((SECONDS + tlimit)) timed_out=0
	while kill -0 "$qpid" 2>/dev/null; do
		if ((SECONDS >= end)); then
			echo "rdma-vm: the guest ran past ${tlimit}s: stopped" >&2
			timed_out=1
			kill "$qpid" 2>/dev/null
			break
		fi
		sleep 0.2
	done
	wait "$qpid" 2>/dev/null
	qpid=
	if [[ -f $run/rc ]]; then
		rc=$(cat "$run/rc")
	elif ((timed_out)); then
		rc=124
	else
		echo "rdma-vm: the guest ended without a result" >&2
		[[ -f $run/wire.log ]] && sed 's/^/rdma-vm wire: /' "$run/wire.log" >&2
		rc=125
	fi
	return "$rc"
}

case ${1:-} in
prepare) prepare ;;
why-not) why_not ;;
run) shift; run_guest "$@" ;;
*) sed -n '2,23p' "$0" >&2; exit 2 ;;
esac
