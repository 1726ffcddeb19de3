//! Property tests: every envelope variant survives encode → bounded decode.

use exec_server_protocol::{
    ErrorObject, ErrorResponse, Message, Notification, Request, RequestId, Response,
};
use proptest::prelude::*;
use serde_json::Value;

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| Value::Number(n.into())),
        any::<u64>().prop_map(|n| Value::Number(n.into())),
        ".*".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z_]{0,8}", inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn request_id() -> impl Strategy<Value = RequestId> {
    prop_oneof![
        any::<i64>().prop_map(RequestId::Integer),
        ".*".prop_map(RequestId::String)
    ]
}

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        (request_id(), "[a-z/]{1,20}", json_value()).prop_map(|(id, method, params)| {
            Message::Request(Request {
                id,
                method,
                params,
                trace: None,
            })
        }),
        ("[a-z/]{1,20}", json_value())
            .prop_map(|(method, params)| Message::Notification(Notification { method, params })),
        (request_id(), json_value())
            .prop_map(|(id, result)| Message::Response(Response { id, result })),
        (request_id(), any::<i64>(), ".*").prop_map(|(id, code, msg)| Message::Error(
            ErrorResponse {
                id,
                error: ErrorObject::new(code, msg)
            }
        )),
    ]
}

proptest! {
    #[test]
    fn encode_then_decode_is_identity(m in message()) {
        let text = m.encode();
        prop_assert!(!text.contains("\"jsonrpc\""));
        let back = Message::decode(text.as_bytes()).unwrap();
        // `result: null` and absent params decode to Null, so compare re-encodings.
        prop_assert_eq!(back.encode(), text);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = Message::decode(&bytes);
    }
}
