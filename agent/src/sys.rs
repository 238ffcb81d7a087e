//! The two kernel calls no safe crate offers: re-reading a disk's
//! partition table (the BLKRRPART ioctl, which image2disk does after
//! writing, as partprobe would) and kexec_file_load(2). Each is one call
//! on file descriptors we own, with no pointers kept past the call.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsRawFd;

/// BLKRRPART = _IO(0x12, 95).
const BLKRRPART: libc::c_ulong = (0x12 << 8) | 95;

/// Asks the kernel to re-read `disk`'s partition table (ENOTTY for a plain
/// file, EINVAL for a partition).
pub fn reread_partitions(disk: &File) -> std::io::Result<()> {
    // SAFETY: BLKRRPART takes no argument; the fd is open for the call.
    let r = unsafe { libc::ioctl(disk.as_raw_fd(), BLKRRPART as _, 0) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Loads `kernel` (and `initrd`) with `cmdline` for the next
/// reboot(LINUX_REBOOT_CMD_KEXEC).
pub fn kexec_file_load(kernel: &File, initrd: Option<&File>, cmdline: &str) -> std::io::Result<()> {
    let cmd = CString::new(cmdline)
        .map_err(|_| std::io::Error::other("the kernel command line holds a NUL byte"))?;
    let bytes = cmd.as_bytes_with_nul();
    let (initrd_fd, flags) = match initrd {
        Some(f) => (f.as_raw_fd(), 0),
        None => (-1, libc::KEXEC_FILE_NO_INITRAMFS),
    };
    // SAFETY: the fds are open, `cmd` outlives the call, and the length
    // given includes its terminating NUL as the syscall requires.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kexec_file_load,
            kernel.as_raw_fd(),
            initrd_fd,
            bytes.len() as libc::c_ulong,
            bytes.as_ptr(),
            flags as libc::c_ulong,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
