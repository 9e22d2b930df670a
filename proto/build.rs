//! Compiles `proto/leasehold.proto` with protox (pure Rust, no protoc
//! needed) and keeps its encoded descriptor set for gRPC reflection.
use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/leasehold.proto");
    let fds = protox::compile(["proto/leasehold.proto"], ["proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("leasehold_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
