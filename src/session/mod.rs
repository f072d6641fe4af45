//! Sessions: the dsh-compatible JSONL log format, the store that writes, repairs and reads it,
//! and the in-memory live session the agent loop appends to.

pub(crate) mod canonical;
pub(crate) mod catalog_index;
pub(crate) mod chunk;
pub(crate) mod data;
pub mod descriptor;
pub(crate) mod dir_memo;
pub(crate) mod estimate;
pub(crate) mod event;
pub(crate) mod fuzz_files;
pub(crate) mod inbox;
pub(crate) mod layout;
pub(crate) mod live;
pub(crate) mod query;
pub(crate) mod record;
pub(crate) mod repair;
mod resident;
pub(crate) mod scan;
pub(crate) mod store;
pub(crate) mod store_scan;
pub(crate) mod surface;
mod warn;
pub(crate) mod watch;
pub(crate) mod writer;

pub(crate) use event::EventBody;
pub use event::Kind;
pub(crate) use event::cut_chars;
pub use live::Session;
pub use live::SessionObserver;
pub(crate) use live::now_ms;
pub use record::Event;
pub use record::Record;
pub use record::SessionHeader;
pub use store::SessionStore;
pub use store::StoreError;
pub(crate) use store::StoredSession;
pub use surface::derive_messages;
