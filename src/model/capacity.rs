//! What kin knows about a route's model besides how to call it: its context window and its
//! price. The window comes from the config (`[model_settings.models."P/M"]`,
//! `[providers.P.models.M]`, `[providers.P]`, in that order), else from a built-in table for the
//! models kin's docs name (DeepSeek, OpenAI and Anthropic routes of the built-in providers, dated
//! snapshots included), else from `[model_settings]`. A price is known only when the config gives
//! one (`input_price_per_mtok` and `output_price_per_mtok`, US dollars per million tokens).

use super::ModelRoute;

/// The context windows of the models kin's docs name, by built-in provider.
const BUILT_IN: &[(&str, &str, u64)] = &[
    ("deepseek", "deepseek-v4-flash", 1_000_000),
    ("deepseek", "deepseek-v4-pro", 1_000_000),
    ("deepseek", "deepseek-chat", 128_000),
    ("deepseek", "deepseek-reasoner", 128_000),
    ("openai", "gpt-5.1", 400_000),
    ("openai", "gpt-5", 400_000),
    ("openai", "gpt-5-mini", 400_000),
    ("openai", "gpt-5-nano", 400_000),
    ("openai", "gpt-4.1", 1_047_576),
    ("openai", "gpt-4.1-mini", 1_047_576),
    ("openai", "gpt-4o", 128_000),
    ("openai", "gpt-4o-mini", 128_000),
    ("anthropic", "claude-opus-4-5", 200_000),
    ("anthropic", "claude-sonnet-4-5", 200_000),
    ("anthropic", "claude-haiku-4-5", 200_000),
    ("anthropic", "claude-opus-4-1", 200_000),
    ("anthropic", "claude-opus-4", 200_000),
    ("anthropic", "claude-sonnet-4", 200_000),
];

/// What a route costs: US dollars per million input and output tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
}

impl Price {
    /// The cost of `input` and `output` tokens, in dollars.
    pub fn cost(&self, input: u64, output: u64) -> f64 {
        (input as f64 * self.input_per_mtok + output as f64 * self.output_per_mtok) / 1_000_000.0
    }
}

/// What kin knows about one route's model.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ModelInfo {
    /// Tokens the model's context holds (requests and their answers), when known.
    pub context_window: Option<u64>,
    pub price: Option<Price>,
}

/// One config entry: what it sets (`None`: it leaves that to a less specific entry).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ModelEntry {
    pub context_window: Option<u64>,
    pub price: Option<Price>,
}

/// The configured entries, most specific first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelTable {
    /// `[model_settings.models."P/M"]` and `[providers.P.models.M]`, by route (`P/M`); the first
    /// entry of a route wins.
    pub routes: Vec<(String, ModelEntry)>,
    /// `[providers.P]`: every model of provider `P`.
    pub providers: Vec<(String, ModelEntry)>,
    /// Providers declared in the config: the built-in table does not describe their models.
    pub named: Vec<String>,
    /// `[model_settings]`: any route nothing else describes.
    pub fallback: ModelEntry,
}

impl ModelTable {
    /// What kin knows about `route`'s model.
    pub fn info(&self, route: &ModelRoute) -> ModelInfo {
        let name = route.to_string();
        let exact = self.routes.iter().find(|(r, _)| *r == name).map(|(_, e)| *e);
        let provider = self.providers.iter().find(|(p, _)| *p == route.provider).map(|(_, e)| *e);
        let built_in = (!self.named.contains(&route.provider))
            .then(|| built_in_window(&route.provider, &route.model))
            .flatten()
            .map(|window| ModelEntry { context_window: Some(window), price: None });
        let entries = [exact, provider, built_in, Some(self.fallback)];
        let mut info = ModelInfo::default();
        for entry in entries.into_iter().flatten() {
            info.context_window = info.context_window.or(entry.context_window);
            info.price = info.price.or(entry.price);
        }
        info
    }
}

/// The built-in window of `provider`'s `model`: an exact name, or a name followed by a dated
/// snapshot suffix (`claude-sonnet-4-5-20250929`, `gpt-4o-2024-08-06`); the longest name wins.
fn built_in_window(provider: &str, model: &str) -> Option<u64> {
    let dated = |suffix: &str| {
        suffix.len() >= 4
            && suffix.bytes().take(4).all(|b| b.is_ascii_digit())
            && suffix.bytes().all(|b| b.is_ascii_digit() || b == b'-')
    };
    BUILT_IN
        .iter()
        .filter(|(p, _, _)| *p == provider)
        .filter(|(_, name, _)| {
            model == *name || model.strip_prefix(name).and_then(|rest| rest.strip_prefix('-')).is_some_and(dated)
        })
        .max_by_key(|(_, name, _)| name.len())
        .map(|(_, _, window)| *window)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(text: &str) -> ModelRoute {
        ModelRoute::parse(text).unwrap()
    }

    fn window(table: &ModelTable, text: &str) -> Option<u64> {
        table.info(&route(text)).context_window
    }

    #[test]
    fn the_built_in_table_knows_the_documented_models_and_their_snapshots() {
        let table = ModelTable::default();
        assert_eq!(window(&table, "deepseek/deepseek-v4-flash"), Some(1_000_000));
        assert_eq!(window(&table, "openai/gpt-5.1"), Some(400_000));
        assert_eq!(window(&table, "anthropic/claude-sonnet-4-5"), Some(200_000));
        assert_eq!(window(&table, "anthropic/claude-sonnet-4-5-20250929"), Some(200_000));
        assert_eq!(window(&table, "anthropic/claude-opus-4-5-20251101"), Some(200_000));
        assert_eq!(window(&table, "openai/gpt-4o-2024-08-06"), Some(128_000));
        assert_eq!(window(&table, "openai/gpt-4o-audio"), None, "not a dated snapshot");
        assert_eq!(window(&table, "ollama/deepseek-v4-flash"), None, "only the built-in providers");
        assert_eq!(table.info(&route("openai/gpt-5.1")).price, None, "no built-in prices");
    }

    #[test]
    fn config_entries_override_in_order_of_specificity() {
        let entry = |window: u64| ModelEntry { context_window: Some(window), price: None };
        let price = Price { input_per_mtok: 0.28, output_per_mtok: 0.42 };
        let table = ModelTable {
            routes: vec![
                ("deepseek/deepseek-v4-flash".into(), entry(2000)),
                ("local/big".into(), ModelEntry { context_window: Some(64_000), price: Some(price) }),
            ],
            providers: vec![
                ("local".into(), entry(8192)),
                ("deepseek".into(), ModelEntry { context_window: None, price: Some(price) }),
            ],
            named: vec!["local".into(), "deepseek".into()],
            fallback: entry(4096),
        };
        assert_eq!(window(&table, "deepseek/deepseek-v4-flash"), Some(2000));
        assert_eq!(table.info(&route("deepseek/deepseek-v4-flash")).price, Some(price));
        assert_eq!(window(&table, "local/big"), Some(64_000));
        assert_eq!(window(&table, "local/small"), Some(8192));
        // A provider declared in the config is not the built-in one: its models fall back.
        assert_eq!(window(&table, "deepseek/deepseek-v4-pro"), Some(4096));
        assert_eq!(window(&table, "other/x"), Some(4096));
        assert_eq!(Price { input_per_mtok: 2.0, output_per_mtok: 10.0 }.cost(500_000, 100_000), 2.0);
    }
}
