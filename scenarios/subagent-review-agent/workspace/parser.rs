fn parse(input: &str) {}
