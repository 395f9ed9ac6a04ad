//! OpenTelemetry traces for `turnstile serve` (feature `otel`, on by default): the server's
//! request spans (turnstile_server::spans) exported over OTLP, configured by the standard
//! `OTEL_*` variables only, and off — no exporter, no layer, the spans' flag down — when none
//! is set. docs/service.md, "Tracing".
//!
//! This module reads the sampler (`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`): the
//! server draws its root requests at the sampler's ratio before it makes their spans (a span
//! made to be dropped would cost more than the request). The SDK reads the resource (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`), the batch processor's
//! settings (`OTEL_BSP_*`) and the exporter's endpoint, headers, timeout and compression
//! (`OTEL_EXPORTER_OTLP_*`); this module picks the protocol
//! (`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, then `OTEL_EXPORTER_OTLP_PROTOCOL`: `grpc` or
//! `http/protobuf`, the default) and honours `OTEL_SDK_DISABLED` and
//! `OTEL_TRACES_EXPORTER=none`.
//!
//! The exporter's connections live on a runtime of their own (one thread): the SDK's batch
//! processor exports from its own thread, outside any runtime, and neither tonic's channel
//! nor hyper's client can spawn from there.

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{Link, SpanKind, TraceContextExt, TraceId, TracerProvider as _};
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, SpanExporter, WithHttpConfig};
use opentelemetry_sdk::trace::{
    Sampler, SamplingDecision, SamplingResult, SdkTracerProvider, ShouldSample,
};
use opentelemetry_sdk::Resource;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;

/// Why tracing could not be set up as the variables ask.
#[derive(Debug)]
pub(crate) enum OtelError {
    /// A protocol this build does not export with.
    Protocol { var: &'static str, value: String },
    /// The exporter's runtime could not start.
    Runtime(std::io::Error),
    /// The exporter could not be built (an endpoint that is not a URL, ...).
    Exporter(opentelemetry_otlp::ExporterBuildError),
    /// A sampler this build does not know, or a ratio that is not one.
    Sampler { var: &'static str, value: String },
}

impl fmt::Display for OtelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OtelError::Protocol { var, value } => write!(
                f,
                "{var}={value:?}: turnstile exports traces over `grpc` or `http/protobuf`; set one of them (or unset it for http/protobuf)"
            ),
            OtelError::Runtime(e) => write!(f, "the OTLP exporter's runtime: {e}"),
            OtelError::Sampler { var, value } => write!(
                f,
                "{var}={value:?}: expected always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio, and for the ratios OTEL_TRACES_SAMPLER_ARG a number from 0 to 1"
            ),
            OtelError::Exporter(e) => write!(
                f,
                "the OTLP exporter (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT): {e}"
            ),
        }
    }
}

impl std::error::Error for OtelError {}

/// The exporting pipeline while the server runs: dropped, it exports what is left (within
/// the exporter's timeout) and stops.
pub(crate) struct Tracing {
    provider: SdkTracerProvider,
    // Dropped after the provider's shutdown (Drop runs before the fields drop): the last
    // export still has its connections.
    _runtime: tokio::runtime::Runtime,
}

impl Drop for Tracing {
    fn drop(&mut self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "OpenTelemetry: the last spans were not exported");
        }
    }
}

/// Whether the environment asks for traces: some `OTEL_*` variable is set, and neither
/// `OTEL_SDK_DISABLED=true` nor `OTEL_TRACES_EXPORTER=none`.
fn wanted(vars: impl Iterator<Item = (String, String)>) -> bool {
    let mut any = false;
    for (k, v) in vars {
        let v = v.trim();
        match k.as_str() {
            "OTEL_SDK_DISABLED" if v.eq_ignore_ascii_case("true") => return false,
            "OTEL_TRACES_EXPORTER" if v.eq_ignore_ascii_case("none") => return false,
            k if k.starts_with("OTEL_") => any = true,
            _ => {}
        }
    }
    any
}

/// The protocol the variables name (`http/protobuf` when none does).
fn protocol(get: impl Fn(&str) -> Option<String>) -> Result<Protocol, OtelError> {
    for var in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        let Some(value) = get(var) else { continue };
        return match value.trim().to_ascii_lowercase().as_str() {
            "grpc" => Ok(Protocol::Grpc),
            "http/protobuf" => Ok(Protocol::HttpBinary),
            _ => Err(OtelError::Protocol { var, value }),
        };
    }
    Ok(Protocol::HttpBinary)
}

/// The sampler the variables name (`parentbased_always_on` when none does), and the share of
/// root requests it keeps.
fn sampler(get: impl Fn(&str) -> Option<String>) -> Result<(Sampler, f64), OtelError> {
    let name = get("OTEL_TRACES_SAMPLER").map(|v| v.trim().to_ascii_lowercase());
    let ratio = || -> Result<f64, OtelError> {
        // The specification's default when the argument is missing: 1.
        let Some(a) = get("OTEL_TRACES_SAMPLER_ARG") else {
            return Ok(1.0);
        };
        match a.trim().parse::<f64>() {
            Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
            _ => Err(OtelError::Sampler {
                var: "OTEL_TRACES_SAMPLER_ARG",
                value: a,
            }),
        }
    };
    let parent = |root: Sampler| Sampler::ParentBased(Box::new(root));
    Ok(match name.as_deref() {
        None | Some("parentbased_always_on") => (parent(Sampler::AlwaysOn), 1.0),
        Some("always_on") => (Sampler::AlwaysOn, 1.0),
        Some("always_off") => (Sampler::AlwaysOff, 0.0),
        Some("parentbased_always_off") => (parent(Sampler::AlwaysOff), 0.0),
        Some("traceidratio") => {
            let r = ratio()?;
            (Sampler::TraceIdRatioBased(r), r)
        }
        Some("parentbased_traceidratio") => {
            let r = ratio()?;
            (parent(Sampler::TraceIdRatioBased(r)), r)
        }
        Some(_) => {
            return Err(OtelError::Sampler {
                var: "OTEL_TRACES_SAMPLER",
                value: get("OTEL_TRACES_SAMPLER").unwrap_or_default(),
            })
        }
    })
}

/// The exporting side of the server's sampling: the server spans a root request only when it
/// has drawn it at the sampler's ratio (turnstile_server::spans::enable), so a root span is
/// kept; a local parent's decision is its children's; a caller's trace (a remote parent) goes
/// to the sampler the variables name.
#[derive(Clone, Debug)]
struct Drawn(Sampler);

impl ShouldSample for Drawn {
    fn should_sample(
        &self,
        parent: Option<&opentelemetry::Context>,
        trace_id: TraceId,
        name: &str,
        kind: &SpanKind,
        attributes: &[opentelemetry::KeyValue],
        links: &[Link],
    ) -> SamplingResult {
        let sc = parent
            .filter(|c| c.has_active_span())
            .map(|c| c.span().span_context().clone())
            .filter(|sc| sc.is_valid());
        match sc {
            Some(sc) if sc.is_remote() => self
                .0
                .should_sample(parent, trace_id, name, kind, attributes, links),
            Some(sc) => SamplingResult {
                decision: if sc.is_sampled() {
                    SamplingDecision::RecordAndSample
                } else {
                    SamplingDecision::Drop
                },
                attributes: Vec::new(),
                trace_state: sc.trace_state().clone(),
            },
            None => SamplingResult {
                decision: SamplingDecision::RecordAndSample,
                attributes: Vec::new(),
                trace_state: Default::default(),
            },
        }
    }
}

/// The layer that exports the request spans, a line for the log saying so, and what keeps the
/// export running, if the environment asks for traces; the server's spans turned on with it.
pub(crate) fn from_env(
) -> Result<Option<(turnstile_server::TraceLayer, String, Tracing)>, OtelError> {
    let vars = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)));
    if !wanted(vars) {
        return Ok(None);
    }
    let proto = protocol(|k| std::env::var(k).ok())?;
    let (sampler, roots) = sampler(|k| std::env::var(k).ok())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("otel-export")
        .enable_all()
        .build()
        .map_err(OtelError::Runtime)?;
    let exporter = {
        // tonic's channel spawns its connection on the runtime current when it is built.
        let _in = runtime.enter();
        match proto {
            Protocol::Grpc => SpanExporter::builder().with_tonic().build(),
            _ => SpanExporter::builder()
                .with_http()
                .with_http_client(OnRuntime::new(runtime.handle().clone()))
                .build(),
        }
        .map_err(OtelError::Exporter)?
    };
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none()
        && !std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|a| a.contains("service.name="))
    {
        resource = resource.with_service_name("turnstile");
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(Drawn(sampler))
        .with_resource(resource.build())
        .build();
    let tracer = provider.tracer("turnstile");
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        // Only what the spans say: no source locations, threads or busy/idle times.
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        // The request spans alone, decided per callsite (a target filter): the log's
        // events are never asked again, and the highest level stays the log's.
        .with_filter(
            tracing_subscriber::filter::Targets::new()
                .with_target(turnstile_server::spans::TARGET, tracing::Level::INFO),
        )
        .boxed();
    turnstile_server::spans::enable(Some(parent), roots);
    let what = format!(
        "OpenTelemetry traces on: OTLP over {}",
        if proto == Protocol::Grpc {
            "gRPC"
        } else {
            "HTTP/protobuf"
        }
    );
    Ok(Some((
        layer,
        what,
        Tracing {
            provider,
            _runtime: runtime,
        },
    )))
}

/// Continues a caller's trace (W3C trace context) in `span`.
fn parent(span: &tracing::Span, traceparent: &str, tracestate: Option<&str>) {
    let mut carrier = std::collections::HashMap::with_capacity(2);
    carrier.insert("traceparent".to_string(), traceparent.to_string());
    if let Some(ts) = tracestate {
        carrier.insert("tracestate".to_string(), ts.to_string());
    }
    let cx = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&carrier);
    // A malformed traceparent gives an empty context: the span stays a root.
    let _ = span.set_parent(cx);
}

/// OTLP/HTTP's client: hyper's, its requests run on the exporter's runtime (the batch
/// processor's thread has none).
#[derive(Debug)]
struct OnRuntime {
    handle: tokio::runtime::Handle,
    client: Arc<opentelemetry_http::hyper::HyperClient>,
}

impl OnRuntime {
    fn new(handle: tokio::runtime::Handle) -> Self {
        // The exporter's own timeout (OTEL_EXPORTER_OTLP_TIMEOUT) bounds an export too; this
        // one is the spec's default.
        let client = {
            let _in = handle.enter();
            opentelemetry_http::hyper::HyperClient::with_default_connector(
                Duration::from_secs(10),
                None,
            )
        };
        Self {
            handle,
            client: Arc::new(client),
        }
    }
}

#[async_trait::async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        self.handle
            .spawn(async move { client.send_bytes(request).await })
            .await?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(v: &[(&str, &str)]) -> impl Iterator<Item = (String, String)> {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<Vec<_>>()
            .into_iter()
    }

    #[test]
    fn any_otel_variable_asks_unless_disabled() {
        assert!(!wanted(vars(&[("PATH", "/bin"), ("RUST_LOG", "info")])));
        assert!(wanted(vars(&[("OTEL_SERVICE_NAME", "rl")])));
        assert!(wanted(vars(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://127.0.0.1:4317"
        )])));
        assert!(!wanted(vars(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("OTEL_SDK_DISABLED", "TRUE"),
        ])));
        assert!(wanted(vars(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("OTEL_SDK_DISABLED", "false"),
        ])));
        assert!(!wanted(vars(&[
            ("OTEL_TRACES_EXPORTER", "none"),
            ("OTEL_SERVICE_NAME", "rl"),
        ])));
    }

    #[test]
    fn samplers_as_the_specification_names_them() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let (s, r) = sampler(env(&[])).unwrap();
        assert!(matches!(s, Sampler::ParentBased(_)) && r == 1.0);
        let (s, r) = sampler(env(&[
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.01"),
        ]))
        .unwrap();
        assert!(matches!(s, Sampler::ParentBased(_)) && r == 0.01);
        let (s, r) = sampler(env(&[
            ("OTEL_TRACES_SAMPLER", "traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.5"),
        ]))
        .unwrap();
        assert!(matches!(s, Sampler::TraceIdRatioBased(x) if x == 0.5) && r == 0.5);
        let (_, r) = sampler(env(&[("OTEL_TRACES_SAMPLER", "always_off")])).unwrap();
        assert_eq!(r, 0.0);
        let (_, r) = sampler(env(&[("OTEL_TRACES_SAMPLER", "traceidratio")])).unwrap();
        assert_eq!(r, 1.0, "no argument: the specification's 1");
        for bad in [
            &[("OTEL_TRACES_SAMPLER", "jaeger_remote")][..],
            &[
                ("OTEL_TRACES_SAMPLER", "traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "1.5"),
            ],
            &[
                ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "one"),
            ],
        ] {
            let e = sampler(env(bad)).unwrap_err().to_string();
            assert!(e.contains("expected always_on"), "{e}");
        }
    }

    #[test]
    fn the_traces_protocol_wins_and_http_protobuf_is_the_default() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(protocol(env(&[])).unwrap(), Protocol::HttpBinary);
        assert_eq!(
            protocol(env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")])).unwrap(),
            Protocol::Grpc
        );
        assert_eq!(
            protocol(env(&[
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
            ]))
            .unwrap(),
            Protocol::HttpBinary
        );
        let e = protocol(env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")])).unwrap_err();
        assert!(e.to_string().contains("http/json"), "{e}");
    }
}
