//! The HTTP models of one process behind one `Model`: a client per provider, built on first use
//! for the route a request names. A route that cannot be served fails its call with
//! `INVALID_CONFIG` (the HTTP clients' own failure path, `http::failed`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use super::http::{INVALID_CONFIG, Server, failed};
use super::router::{ModelSettings, WireApi, client_for, endpoint, missing_key, takes_images};
use super::{ChunkStream, Failure, MissingKey, Model, ModelRequest, ModelRoute};

/// Where a key is looked up by variable name when the environment has none: `kin login`'s store.
pub(crate) type KeyLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// The HTTP models of one process: a client per provider, built on first use for the route a
/// request names (so a session can switch models between turns). Keys come from the
/// environment, else from `stored`. A client is kept only once it has its key: a provider whose
/// key was missing is looked up again on the next call, so a `kin login` while kin runs takes
/// effect.
pub(crate) struct Routed {
    settings: ModelSettings,
    stored: KeyLookup,
    clients: Mutex<HashMap<String, Arc<dyn Model>>>,
}

impl Routed {
    /// Checks that `default` can be served (an unknown provider is a startup error). The key is
    /// not looked up here: `stored` may ask the OS credential store (a D-Bus connection and its
    /// threads), which a process that never calls the model does not need at start.
    pub(crate) fn new(default: &ModelRoute, settings: ModelSettings, stored: KeyLookup) -> Result<Self, String> {
        endpoint(&default.provider, &settings, &crate::config::process_env)
            .map_err(|e| format!("route {default}: {e}"))?;
        Ok(Routed { settings, stored, clients: Mutex::new(HashMap::new()) })
    }

    /// The provider's server with its key: the environment's, else the stored one.
    fn server(&self, route: &ModelRoute) -> Result<(WireApi, Server), String> {
        let (api, mut server) = endpoint(&route.provider, &self.settings, &crate::config::process_env)
            .map_err(|e| format!("route {route}: {e}"))?;
        if server.api_key.is_none() {
            server.api_key = server.api_key_env.as_deref().and_then(|v| (self.stored)(v));
        }
        Ok((api, server))
    }

    fn client(&self, route: &ModelRoute) -> Result<Arc<dyn Model>, String> {
        let mut clients = self.clients.lock().map_err(|_| "model clients poisoned".to_string())?;
        if let Some(client) = clients.get(&route.provider) {
            return Ok(client.clone());
        }
        let (api, server) = self.server(route)?;
        let keyed = missing_key(&route.provider, &server).is_none();
        let client = client_for(api, server, &self.settings, takes_images(route, &self.settings))?;
        if keyed {
            clients.insert(route.provider.clone(), client.clone());
        }
        Ok(client)
    }
}

impl Model for Routed {
    fn stream(&self, request: ModelRequest, cancel: CancellationToken) -> ChunkStream {
        match self.client(&request.route) {
            Ok(client) => client.stream(request, cancel),
            Err(message) => failed(Failure::new(message, INVALID_CONFIG)),
        }
    }
}

impl Routed {
    /// The API key a call on `route` would need and cannot find, so a session can be refused
    /// before its first turn fails.
    pub(crate) fn missing_key(&self, route: &ModelRoute) -> Option<MissingKey> {
        if self.clients.lock().is_ok_and(|c| c.contains_key(&route.provider)) {
            return None;
        }
        let (_, server) = self.server(route).ok()?;
        missing_key(&route.provider, &server)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::model::router::{NamedProvider, ProviderKind};

    /// Settings with one named provider whose key variable no environment sets.
    fn settings() -> ModelSettings {
        let provider = NamedProvider {
            name: "local".into(),
            base_url: "http://127.0.0.1:9".into(),
            api_key_env: Some("KIN_TEST_ROUTED_KEY_NOBODY_SETS".into()),
            headers: Vec::new(),
            kind: ProviderKind::OpenAi,
            images: false,
        };
        ModelSettings { providers: vec![provider], ..ModelSettings::default() }
    }

    #[test]
    fn the_key_store_is_asked_on_first_use_not_at_start() {
        let asked = Arc::new(AtomicUsize::new(0));
        let counter = asked.clone();
        let stored: KeyLookup = Arc::new(move |_: &str| {
            counter.fetch_add(1, Ordering::SeqCst);
            None
        });
        let route = ModelRoute::parse("local/some-model").unwrap();
        let routed = Routed::new(&route, settings(), stored).unwrap();
        assert_eq!(asked.load(Ordering::SeqCst), 0, "Routed::new asked the key store");
        assert!(routed.missing_key(&route).is_some());
        assert_eq!(asked.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn an_unknown_provider_is_still_refused_at_start() {
        let route = ModelRoute::parse("nowhere/some-model").unwrap();
        let error = Routed::new(&route, settings(), Arc::new(|_: &str| None)).err().unwrap();
        assert!(error.contains("nowhere"), "{error}");
    }

    #[tokio::test]
    async fn a_route_it_cannot_serve_fails_the_call_alone_with_invalid_config() {
        let default = ModelRoute::parse("local/some-model").unwrap();
        let routed = Routed::new(&default, settings(), Arc::new(|_: &str| None)).unwrap();
        let request = ModelRequest {
            session_id: "s".into(),
            turn: 1,
            step: 1,
            cwd: None,
            route: ModelRoute::parse("nowhere/some-model").unwrap(),
            system: String::new(),
            messages: Arc::new(Vec::new()),
            tools: Vec::new(),
            purpose: crate::model::Purpose::Step,
            max_tokens: None,
        };
        let mut stream = routed.stream(request, CancellationToken::new());
        let Some(Err(failure)) = stream.recv().await else { panic!("the call did not fail") };
        assert_eq!(failure.code, INVALID_CONFIG);
        assert!(failure.message.contains("nowhere"), "{}", failure.message);
        assert!(stream.recv().await.is_none(), "the failure ends the stream");
    }
}
