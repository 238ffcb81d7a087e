//! Integration tests: the real `tinkerbox` binary, driven by its own CLI and
//! by curl/openssl, on loopback ports. One test binary (one link) for all.

mod boot;
mod common;
mod daemon;
mod dhcp;
mod hardware;
mod metadata;
