//! `todo_write`: the model's structured task list. Each call sends the whole list, which replaces
//! the previous one; the tool validates it and answers with dsh's text (the counts by status).
//! Recording the `todo/write` event and the ACP plan update is the caller's job, through
//! `parse_todos`.

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::{Access, Tool, ToolContext, ToolError, ToolOutput};
use crate::session::event;

/// The state of one todo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TodoStatus {
    Pending,
    InProgress,
    Completed,
}

impl TodoStatus {
    /// The wire name: `pending`, `in_progress` or `completed`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TodoStatus::Pending => "pending",
            TodoStatus::InProgress => "in_progress",
            TodoStatus::Completed => "completed",
        }
    }

    pub(crate) fn parse(name: &str) -> Option<Self> {
        match name {
            "pending" => Some(TodoStatus::Pending),
            "in_progress" => Some(TodoStatus::InProgress),
            "completed" => Some(TodoStatus::Completed),
            _ => None,
        }
    }
}

/// One item of the task list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Todo {
    pub content: String,
    pub status: TodoStatus,
}

/// The `todos` argument, validated. A JSON string holding the array is accepted too (some models
/// encode it twice).
pub(crate) fn parse_todos(args: &Value) -> Result<Vec<Todo>, ToolError> {
    let decoded;
    let todos = match args.get("todos") {
        Some(Value::String(text)) => {
            decoded = serde_json::from_str::<Value>(text)
                .map_err(|_| invalid("`todos` must be an array of {content, status} objects, got a string"))?;
            &decoded
        }
        Some(value) => value,
        None => {
            return Err(invalid("missing required argument `todos` (an array of {content, status} objects)"));
        }
    };
    let Some(items) = todos.as_array() else {
        return Err(invalid(format!("`todos` must be an array of {{content, status}} objects, got {todos}")));
    };
    items.iter().enumerate().map(|(index, item)| parse_todo(index + 1, item)).collect()
}

/// Item `number` (1-based) of the list.
fn parse_todo(number: usize, item: &Value) -> Result<Todo, ToolError> {
    let content = item
        .get("content")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|content| !content.is_empty())
        .ok_or_else(|| invalid(format!("todo {number} needs a non-empty string `content`, got {item}")))?;
    let raw_status = item.get("status").and_then(Value::as_str);
    let status = raw_status.and_then(TodoStatus::parse).ok_or_else(|| {
        let got = raw_status.map_or_else(|| "no status".to_string(), |s| format!("status \"{s}\""));
        invalid(format!("todo {number} (\"{content}\") has {got}; use pending, in_progress or completed"))
    })?;
    Ok(Todo { content: content.to_string(), status })
}

fn invalid(message: impl Into<String>) -> ToolError {
    ToolError::new("INVALID_TODOS", format!("todo_write: {}", message.into()))
}

/// dsh's answer to `todo_write` (dsh-design.md §4.1): the counts of the new list by status.
pub(crate) fn render_todos(todos: &[Todo]) -> String {
    let count = |status: TodoStatus| todos.iter().filter(|todo| todo.status == status).count();
    format!(
        "Updated todo list: {} pending, {} in progress, {} completed.",
        count(TodoStatus::Pending),
        count(TodoStatus::InProgress),
        count(TodoStatus::Completed)
    )
}

/// `todo_write`: replaces the session's task list.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TodoWriteTool;

impl Tool for TodoWriteTool {
    fn name(&self) -> &str {
        "todo_write"
    }

    fn access(&self, _arguments: &Value) -> Access {
        Access::Plan
    }

    fn title(&self, _arguments: &Value) -> String {
        "Update plan".into()
    }

    fn guidance(&self) -> Option<&'static str> {
        Some(
            "for work with several steps, keep a task list (the whole list each call, at most one \
             item in progress) and update it as you go.",
        )
    }

    fn description(&self) -> String {
        "Record and update a structured task list for the current work. Send the ENTIRE list \
         every call — it REPLACES the previous list (there are no partial updates, no per-item \
         edits). Use it to plan multi-step work and show progress: add one todo per concrete \
         step before you start. Keep AT MOST ONE todo `in_progress` at a time; while work \
         remains, exactly one active task should be `in_progress`. Mark a todo `completed` the \
         moment it is done (do not batch completions), and allow no `in_progress` item only \
         once all work is complete. Skip the list for trivial single-step tasks. Statuses: \
         `pending` (not started), `in_progress` (being worked on now), `completed` (finished)."
            .to_string()
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "todos": {
                    "type": "array",
                    "description": "The COMPLETE task list, replacing any previous list.",
                    "items": {
                        "type": "object",
                        "additionalProperties": false,
                        "properties": {
                            "content": {
                                "type": "string",
                                "description": "What the task is — a short imperative line."
                            },
                            "status": {
                                "type": "string",
                                "description": "pending (not started) | in_progress (now) | completed (done).",
                                "enum": ["pending", "in_progress", "completed"]
                            }
                        },
                        "required": ["content", "status"]
                    }
                }
            },
            "required": ["todos"]
        })
    }

    fn execute(&self, arguments: Value, _ctx: ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        async move {
            let todos = parse_todos(&arguments)?;
            let todos_event = event::TodoWrite {
                todos: todos
                    .iter()
                    .map(|t| event::Todo { content: t.content.clone(), status: t.status.as_str().into() })
                    .collect(),
            };
            Ok(ToolOutput::text(render_todos(&todos)).with_event(todos_event))
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_util::sync::CancellationToken;

    fn ctx() -> ToolContext {
        ToolContext::detached(None, CancellationToken::new())
    }

    #[test]
    fn parses_items_in_order() {
        let todos = parse_todos(&json!({"todos": [
            {"content": "Read the code", "status": "completed"},
            {"content": "  Write the fix ", "status": "in_progress"},
            {"content": "Run the tests", "status": "pending"}
        ]}))
        .unwrap();
        assert_eq!(
            todos,
            vec![
                Todo { content: "Read the code".into(), status: TodoStatus::Completed },
                Todo { content: "Write the fix".into(), status: TodoStatus::InProgress },
                Todo { content: "Run the tests".into(), status: TodoStatus::Pending },
            ]
        );
        assert_eq!(todos[1].status.as_str(), "in_progress");
    }

    #[test]
    fn accepts_a_json_encoded_list() {
        let args = json!({"todos": "[{\"content\": \"a\", \"status\": \"pending\"}]"});
        assert_eq!(parse_todos(&args).unwrap().len(), 1);
    }

    #[test]
    fn bad_items_are_named() {
        let err = parse_todos(&json!({"todos": [
            {"content": "fine", "status": "pending"},
            {"content": "Ship it", "status": "done"}
        ]}))
        .unwrap_err();
        assert_eq!(err.code, "INVALID_TODOS");
        assert!(err.message.contains("todo 2"), "{}", err.message);
        assert!(err.message.contains("Ship it"), "{}", err.message);
        assert!(err.message.contains("\"done\""), "{}", err.message);
        let err = parse_todos(&json!({"todos": [{"status": "pending"}]})).unwrap_err();
        assert!(err.message.contains("todo 1"), "{}", err.message);
        let err = parse_todos(&json!({"todos": {"content": "x"}})).unwrap_err();
        assert_eq!(err.code, "INVALID_TODOS");
        let err = parse_todos(&json!({})).unwrap_err();
        assert!(err.message.contains("missing"), "{}", err.message);
    }

    #[tokio::test]
    async fn answers_with_the_counts_of_the_new_list() {
        let args = json!({"todos": [
            {"content": "Read the code", "status": "completed"},
            {"content": "Write the fix", "status": "in_progress"},
            {"content": "Run the tests", "status": "pending"}
        ]});
        let output = TodoWriteTool.execute(args, ctx()).await.unwrap();
        let counts = "Updated todo list: 1 pending, 1 in progress, 1 completed.";
        assert_eq!(output.content, ToolOutput::text(counts).content);
        assert_eq!(output.events.len(), 1, "the plan is recorded as a todo/write event");
        let crate::session::EventBody::TodoWrite(plan) = &output.events[0] else {
            panic!("not a todo/write: {:?}", output.events[0]);
        };
        assert_eq!(plan.todos[1], event::Todo { content: "Write the fix".into(), status: "in_progress".into() });
        let two = render_todos(&[
            Todo { content: "a".into(), status: TodoStatus::InProgress },
            Todo { content: "b".into(), status: TodoStatus::InProgress },
        ]);
        assert_eq!(two, "Updated todo list: 0 pending, 2 in progress, 0 completed.");
        assert_eq!(render_todos(&[]), "Updated todo list: 0 pending, 0 in progress, 0 completed.");
    }
}
