def greet():
    return "hello"
