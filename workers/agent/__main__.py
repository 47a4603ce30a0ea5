from workers.agent.main import main

if __name__ == "__main__":
    main()
