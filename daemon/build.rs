//! sqlx's `migrate!` embeds `migrations/` at compile time; a new file there
//! must rebuild the crate (sqlx's documented build script).
fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
