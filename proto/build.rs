//! Compiles `proto/leasehold.proto` with protox (pure Rust, no protoc needed).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/leasehold.proto");
    let fds = protox::compile(["proto/leasehold.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
