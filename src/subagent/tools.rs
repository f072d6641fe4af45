//! The model-facing delegation tools: `subagent` (provider `spawn`) and `subagent_fork`
//! (provider `fork`). A foreground call waits for the child and returns its final text; a
//! non-completed stop reason is the exact error text of dsh-design.md §1.8; the run is always
//! disposed. An in-process tool offers the session's named agents (`agent`, an enum of their
//! names; the description lists each with what it is for): a child started as one runs with its
//! persona, tools, model, turn limit and permission cap; without `agent` it is the default child.

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::agents::{Agents, Defaults};
use super::continuation::ContinuationManager;
use super::{
    ErrorCode, StartRequest, StopReason, SubagentError, SubagentResult, SubagentService, ToolFilter, child_title,
};
use crate::model::ModelRoute;
use crate::tools::{Access, Tool, ToolContext, ToolError, ToolOutput};

/// Configuration of one delegation tool.
#[derive(Debug, Clone)]
pub struct DelegateConfig {
    pub tool_name: String,
    pub provider: String,
    pub max_depth: Option<u64>,
    pub persona: Option<String>,
    pub tool_filter: Option<ToolFilter>,
    pub route: Option<ModelRoute>,
    pub output_schema: Option<Value>,
    /// A sentence added to the description (e.g. which external agent the child is).
    pub note: Option<String>,
    /// The child is an external agent: a call is titled by the tool's name and its description
    /// (`delegate_codex: review`), and the system prompt gives no advice on it.
    pub external: bool,
}

/// The title of a call delegating to an external agent: `<tool>: <description>`, or the tool's
/// name without a description.
pub(crate) fn external_title(tool_name: &str, description: Option<&str>) -> String {
    match description.filter(|d| !d.trim().is_empty()) {
        Some(description) => format!("{tool_name}: {description}"),
        None => tool_name.to_string(),
    }
}

/// A delegation tool bound to one provider.
#[derive(Clone)]
pub struct DelegateTool {
    config: DelegateConfig,
    service: Arc<SubagentService>,
    /// Present when `run_in_background` (continuable children) is offered.
    background: Option<Arc<ContinuationManager>>,
    inherits_parent_context: bool,
    /// The named agents offered through `agent` (none for a provider that cannot run them).
    agents: Option<Arc<Agents>>,
}

impl DelegateTool {
    /// Builds the tool; the provider must exist (its context inheritance words the description).
    pub fn new(
        config: DelegateConfig,
        service: Arc<SubagentService>,
        background: Option<Arc<ContinuationManager>>,
    ) -> Result<Self, SubagentError> {
        let provider = service.provider(&config.provider)?;
        if config.max_depth.is_some() && !provider.capabilities().depth_limit {
            return Err(SubagentError::new(
                ErrorCode::UnsupportedCapability,
                format!("subagent provider \"{}\" does not support the \"depthLimit\" capability", config.provider),
            ));
        }
        let agents = (!config.external && provider.capabilities().named_agent).then(|| Arc::new(Agents::builtin()));
        Ok(DelegateTool {
            inherits_parent_context: provider.inherits_parent_context(),
            config,
            service,
            background,
            agents,
        })
    }

    /// The same tool offering `agents` (a session's), or `None` when it offers no agents.
    pub fn with_agents(&self, agents: Arc<Agents>) -> Option<DelegateTool> {
        self.agents.as_ref()?;
        Some(DelegateTool { agents: Some(agents), ..self.clone() })
    }

    /// What the default child runs with (`[subagents]`).
    fn defaults(&self) -> Defaults {
        Defaults {
            persona: self.config.persona.clone(),
            tool_filter: self.config.tool_filter.clone(),
            route: self.config.route.clone(),
        }
    }
}

/// The named agent a call chose, resolved, whether it runs in the background by default, and
/// what the user is told about its model when it cannot be resolved.
type Chosen = Option<(super::agents::Launch, Option<bool>, Option<String>)>;

impl DelegateTool {
    /// The agent a call names, resolved against the default child; an unknown name (or any name
    /// for a tool that offers no agents) is the call's error.
    fn choose(&self, arguments: &Value) -> Result<Chosen, ToolError> {
        let Some(name) = agent_argument(arguments)? else {
            return Ok(None);
        };
        let agents = self.agents.as_ref().ok_or_else(|| {
            ToolError::new(
                "INVALID_ARGUMENTS",
                format!("{} starts no named agents; leave out `agent`", self.config.tool_name),
            )
        })?;
        let def = agents.get(name).ok_or_else(|| {
            ToolError::new(
                "UNKNOWN_AGENT",
                format!("unknown agent \"{name}\"; choose one of: {}", agents.names().join(", ")),
            )
        })?;
        Ok(Some((def.launch(&self.defaults()), def.background, def.model_notice())))
    }
}

/// The `agent` argument of a call: absent, null or blank is none.
fn agent_argument(arguments: &Value) -> Result<Option<&str>, ToolError> {
    match arguments.get("agent") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(name)) if name.trim().is_empty() => Ok(None),
        Some(Value::String(name)) => Ok(Some(name.trim())),
        Some(other) => {
            Err(ToolError::new("INVALID_ARGUMENTS", format!("agent must be a string naming an agent, got {other}")))
        }
    }
}

/// One line of text (an agent's description in a list).
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The model-visible text of a non-completed stop reason.
pub(crate) fn stop_reason_error(reason: StopReason) -> &'static str {
    match reason {
        StopReason::Aborted => "subagent run was cancelled",
        StopReason::Error => "subagent run failed",
        StopReason::MaxTokens => "subagent run hit its token limit before finishing",
        StopReason::Refusal => "subagent declined the task",
        StopReason::Completed => "subagent run completed",
    }
}

/// The model-visible text of a run that did not complete: dsh's words for the stop reason,
/// then the cause when there is one (`subagent run failed: <cause>`), then the disposal's
/// failure (`; dispose failed: <cause>`), as dsh-design.md §1.8 words an aggregate failure.
pub(crate) fn stop_text(reason: StopReason, cause: Option<&str>, dispose_failure: Option<&str>) -> String {
    let words = stop_reason_error(reason);
    let mut text = match cause {
        Some(cause) => format!("{words}: {cause}"),
        None => words.to_string(),
    };
    if let Some(dispose) = dispose_failure {
        text.push_str(&format!("; dispose failed: {dispose}"));
    }
    text
}

/// An infrastructure fault's text: `subagent run failed: <fault>`, with the disposal's failure.
fn failed_text(fault: &str, dispose_failure: Option<&str>) -> String {
    stop_text(StopReason::Error, Some(fault), dispose_failure)
}

impl Tool for DelegateTool {
    /// An external agent's run gets its provider's grace to answer the cancel, so its result
    /// (and the `subagent/remote-run` record) is kept.
    fn cancel_grace(&self) -> std::time::Duration {
        let provider = self.service.provider(&self.config.provider).ok().and_then(|p| p.wind_down());
        provider.unwrap_or(crate::tools::CANCEL_GRACE).max(crate::tools::CANCEL_GRACE)
    }

    fn name(&self) -> &str {
        &self.config.tool_name
    }

    /// An in-process child's calls pass this session's gate (`Delegate`); an external agent is a
    /// process kin cannot see into, whose own writes and commands no gate of kin's stops
    /// (`External`: asked about, refused in read-only mode).
    fn access(&self, _arguments: &Value) -> Access {
        if self.config.external { Access::External } else { Access::Delegate }
    }

    /// An in-process child is shown as its own session: the call says what it delegates.
    fn title(&self, arguments: &Value) -> String {
        let description = arguments["description"].as_str();
        if self.config.external {
            external_title(&self.config.tool_name, description)
        } else {
            let agent = agent_argument(arguments).ok().flatten();
            child_title(agent, description).unwrap_or_default()
        }
    }

    fn guidance(&self) -> Option<&'static str> {
        match (self.config.external, self.inherits_parent_context) {
            (true, _) => None,
            (false, false) => Some(
                "delegate a self-contained task to a fresh child agent with a complete prompt; it \
                 returns the child's final answer.",
            ),
            (false, true) => Some("delegate to a child that starts from this conversation's history."),
        }
    }

    fn description(&self) -> String {
        let context = if self.inherits_parent_context {
            "Delegate a task to a forked child agent seeded with all completed turns so far (it does not see the current in-flight turn), so it already knows the conversation; give it a prompt that says what to do next."
        } else {
            "Delegate a task to a fresh child agent with its own context and tools. Give it a complete, standalone prompt: it does not see this conversation."
        };
        let background = if self.background.is_some() {
            " Set `run_in_background: true` to start a background subagent that keeps its conversation: you receive only its subagent id, never its result, and it works on its own. Use this for work whose result you do not need returned by this call; `send_message` sends it more work."
        } else {
            ""
        };
        let note = self.config.note.as_deref().map(|n| format!(" {n}")).unwrap_or_default();
        let mut text = format!(
            "{context}{note} The call waits for the child and returns its final answer as text. Use it for self-contained subtasks (research, a focused change, a review) whose result you need; several calls in one step run in parallel.{background}"
        );
        if let Some(agents) = &self.agents {
            text.push_str(
                "\n\nSet `agent` to start the child as one of these agents (each has its own instructions and tools); without it the child is a general one:",
            );
            for def in agents.iter() {
                text.push_str(&format!("\n- {}: {}", def.name, one_line(&def.description)));
            }
        }
        text
    }

    fn parameters(&self) -> Value {
        let mut schema = json!({
            "type": "object",
            "properties": {
                "description": {"type": "string", "description": "A short (3-5 word) description of the delegated task, for display."},
                "prompt": {"type": "string", "description": "The task for the child agent."},
            },
            "required": ["description", "prompt"],
            "additionalProperties": false,
        });
        if let Some(agents) = &self.agents {
            schema["properties"]["agent"] = json!({
                "type": "string",
                "enum": agents.names(),
                "description": "The agent to start the child as (see the list in the tool description); omit it for a general child.",
            });
        }
        if self.background.is_some() {
            schema["properties"]["run_in_background"] = json!({
                "type": "boolean",
                "description": "Start a background subagent that keeps its conversation; returns only its id.",
            });
        }
        schema
    }

    fn parallel_safe(&self) -> bool {
        true
    }

    fn needs_history(&self) -> bool {
        self.inherits_parent_context
    }

    fn execute(&self, arguments: Value, ctx: ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        let (config, service, background) = (self.config.clone(), self.service.clone(), self.background.clone());
        let chosen = self.choose(&arguments);
        async move {
            let launch = chosen?;
            let parent = ctx.caller.clone().ok_or_else(|| {
                ToolError::new("NO_CALLER", "subagent tool requires a calling agent (exec.agent was undefined)")
            })?;
            let text = |key: &str| {
                arguments[key]
                    .as_str()
                    .map(str::to_string)
                    .ok_or_else(|| ToolError::new("INVALID_ARGUMENTS", format!("{key} must be a string")))
            };
            let (label, prompt) = (text("description")?, text("prompt")?);
            if prompt.trim().is_empty() {
                return Err(ToolError::new(
                    "INVALID_ARGUMENTS",
                    "prompt is empty: give the subagent its whole task (it does not see this conversation otherwise)",
                ));
            }
            let asked_background = crate::tools::args::optional_bool(&arguments, "run_in_background", "subagent")?;
            let (persona, tool_filter, route, agent, background_default) = match launch {
                Some((launch, background, notice)) => {
                    // An unresolved model falls back to the parent's: the editor shows it on
                    // the call, and the parent's log records it as the call's progress.
                    if let (Some(notice), Some(progress)) = (notice, &ctx.progress) {
                        progress.report(notice);
                    }
                    (launch.persona, launch.tool_filter, launch.route, Some(launch.agent), background)
                }
                None => (config.persona.clone(), config.tool_filter.clone(), config.route.clone(), None, None),
            };
            let request = StartRequest {
                label: Some(label),
                prompt: vec![json!({"type": "text", "text": prompt})],
                parent,
                cancel: ctx.cancel.clone(),
                route,
                output_schema: config.output_schema.clone(),
                max_depth: config.max_depth,
                tool_filter,
                persona,
                call_id: Some(ctx.call_id.clone()),
                progress: ctx.progress.clone(),
                agent,
            };
            // An agent that runs in the background by default does so where background children
            // are offered; a call may still say otherwise.
            let in_background = match asked_background {
                Some(asked) => asked,
                None => background_default == Some(true) && background.is_some(),
            };
            if in_background {
                let manager = background.ok_or_else(|| {
                    ToolError::new("INVALID_ARGUMENTS", "run_in_background is not enabled for this tool")
                })?;
                let label = request.label.clone().unwrap_or_default();
                // The start runs to its end even if this call is cut short (`start` hands it to a
                // task of its own): once accepted, the child is owned by the manager, and the
                // caller's cancellation no longer applies.
                let (child_id, _message_id) = manager
                    .start(&config.provider, label, StartRequest { output_schema: None, progress: None, ..request })
                    .await?;
                return Ok(ToolOutput::text(format!("started subagent {child_id}")));
            }
            let run = service.start(&config.provider, request).await?;
            let run_id = run.id.clone();
            let result = run.result.await.unwrap_or_else(|_| {
                Err(SubagentError::new(ErrorCode::Infrastructure, "subagent run ended without a result"))
            });
            let disposed = (run.dispose)().await;
            let result = match result {
                Ok(result) => result,
                // An infrastructure fault: the cause chain, with the disposal's when it failed too.
                Err(fault) => {
                    let mut error = ToolError::from(fault);
                    error.message = failed_text(&error.message, disposed.err().as_deref());
                    return Err(error);
                }
            };
            let SubagentResult { output, structured, stop_reason, failure, remote } = result;
            // A remote run has no child session: the parent's log records it, however it ended.
            let event = remote.as_ref().map(|r| r.event(&run_id, &output, stop_reason));
            let result = match (stop_reason, disposed) {
                (StopReason::Completed, disposed) => {
                    if let Err(e) = disposed {
                        // The answer stands: the child finished; only its teardown went wrong.
                        tracing::warn!(run = %run_id, "subagent dispose failed after a completed run: {e}");
                    }
                    Ok(ToolOutput::text(match structured {
                        Some(structured) => structured.to_string(),
                        None => output,
                    }))
                }
                (other, disposed) => Err(ToolError::named(
                    "SubagentRunError",
                    &other.as_str().to_uppercase().replace('-', "_"),
                    stop_text(other, failure.as_deref(), disposed.err().as_deref()),
                )),
            };
            match (result, event) {
                (Ok(output), Some(run)) => Ok(output.with_event(run)),
                (Err(error), Some(run)) => Err(error.with_event(run)),
                (result, None) => result,
            }
        }
        .boxed()
    }
}
