//! gRPC server reflection (`grpc.reflection.v1` and `v1alpha`): lets
//! `grpcurl`, `grpc_cli` and GUI clients list a port's services and read
//! their schema without the `.proto` file. Each listener advertises only
//! the services it serves.

use tonic_reflection::server::{v1, v1alpha, Builder, Error};

/// Reflection services advertising `services` (fully qualified names,
/// e.g. `leasehold.v1.Coordinator`) plus health and reflection itself.
#[allow(clippy::type_complexity)]
pub fn reflection_services(
    services: &[&str],
) -> Result<
    (
        v1::ServerReflectionServer<impl v1::ServerReflection>,
        v1alpha::ServerReflectionServer<impl v1alpha::ServerReflection>,
    ),
    Error,
> {
    let configure = || {
        let mut builder = Builder::configure()
            .register_encoded_file_descriptor_set(leasehold_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .with_service_name("grpc.health.v1.Health");
        for service in services {
            builder = builder.with_service_name(*service);
        }
        builder
    };
    let v1 = configure()
        .with_service_name("grpc.reflection.v1.ServerReflection")
        .build_v1()?;
    let v1alpha = configure()
        .with_service_name("grpc.reflection.v1alpha.ServerReflection")
        .build_v1alpha()?;
    Ok((v1, v1alpha))
}
